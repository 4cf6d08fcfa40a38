"""Model zoo (see `caramel.models.zoo`)."""
from caramel.models.zoo import MODELS, ModelBatch, get_model, lm_loss, param_count

__all__ = ["MODELS", "ModelBatch", "get_model", "lm_loss", "param_count"]
