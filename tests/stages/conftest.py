"""Stage tests run single-threaded (two pytest workers share two cores) on micro models."""

import torch

torch.set_num_threads(1)
