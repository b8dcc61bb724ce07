"""What the Python tests compare with: relative error, and the module's part of a step's state_dict."""

import numpy as np


def rel_err(a, b):
    """The relative error of a against b in the 2-norm (b's norm floored at 1e-30)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def module_part(state_dict):
    """A step's state_dict without the optimizer's and the step's own entries: the module's."""
    return {k: v for k, v in state_dict.items() if not k.startswith(("optimizer.", "kiln."))}
