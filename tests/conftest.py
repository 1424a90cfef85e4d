"""Suite-wide settings. Each area keeps its fixtures in its own folder's conftest.py."""

import os

# Two cores are shared by two pytest workers: one intra-op thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
