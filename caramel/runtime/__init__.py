"""The runtime: executes a Plan inside the user's training loop (see `engine.py`)."""
from caramel.runtime.engine import Engine
from caramel.runtime.model import CaramelModel
from caramel.runtime.parallelize import mute_gradient_communication, parallelize, schedule_settled, shutdown

__all__ = ["CaramelModel", "Engine", "mute_gradient_communication", "parallelize", "schedule_settled", "shutdown"]
