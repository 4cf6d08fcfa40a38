"""Small hand-checkable profiles and plans for the simulator tests."""
from caramel.topology.spec import ClusterSpec, WorkerSpec
from caramel.plan.planners import plan_from_groups
from caramel.profile.model_profile import ModelProfile, ModuleInfo, ParamInfo


def two_layer_profile(forward=1.0, backward=2.0, optimizer=0.2) -> ModelProfile:
    """layer0.weight (first used at 0.0, ready at 2.0) and layer1.weight (used at 0.5, ready at 1.0), 1000 bytes each."""
    params = [
        ParamInfo(0, "layer0.weight", [250], "float32", 250, 1000, True, ready_order=1, ready_time_s=2.0,
                  first_use_order=0, first_use_time_s=0.0, use_modules=["layer0"]),
        ParamInfo(1, "layer1.weight", [250], "float32", 250, 1000, True, ready_order=0, ready_time_s=1.0,
                  first_use_order=1, first_use_time_s=0.5, use_modules=["layer1"]),
    ]
    modules = [ModuleInfo("layer0", "Linear", 0.0, 0.5, 1.0, [0]), ModuleInfo("layer1", "Linear", 0.5, 0.5, 1.0, [1])]
    return ModelProfile("two-layer", 1, forward, backward, optimizer, params, modules)


def two_bucket_plan(profile, order=((0, 0), (1, 0)), world_size=2):
    """Bucket 0 = layer1.weight (ready first), bucket 1 = layer0.weight."""
    groups = [[profile.params[1]], [profile.params[0]]]
    return plan_from_groups("test", profile, world_size, groups, order=list(order))


def slow_link_cluster(speeds=(1.0, 1.0), latency_s=0.1) -> ClusterSpec:
    """Two workers whose ring all-reduce of 1000 bytes takes 2*latency + 1.0 s."""
    return ClusterSpec([WorkerSpec(f"w{i}", s) for i, s in enumerate(speeds)], bandwidth_bps=8000.0, latency_s=latency_s)
