"""A finished run's tables (stages, checkpoints, buckets, gap, targets) from its manifest, in markdown:
what the README and docs/bench/tiers.md print. The reading is ``ringzero.pipeline.story``.

    python bench/run_story.py runs/tiny-cpu/manifest.json [--tables stages,checkpoints,gap] [--json]
"""

import sys

from ringzero.pipeline.story import main

if __name__ == "__main__":
    sys.exit(main())
