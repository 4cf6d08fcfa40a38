"""experiments/gossip_sim_replay.py: the compute slowdown the new model is given is the one its
rows record (review: the jitter rows used 2.30 on the unpadded compute but recorded 1.34)."""


def test_the_new_model_takes_the_unpadded_jitter_factor_where_recorded():
    from experiments.gossip_sim_replay import new_model_slowdown

    jitter = {"compute_slowdown": 1.34, "prediction_inputs": {"compute_slowdowns": {"jitter": 2.295}}}
    assert new_model_slowdown(jitter) == 2.295
    assert new_model_slowdown({"compute_slowdown": 1.34, "prediction_inputs": {"compute_slowdowns": {}}}) == 1.34
    assert new_model_slowdown({"compute_slowdown": None}) == 1.0
