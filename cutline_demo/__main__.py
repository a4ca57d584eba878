"""``python -m cutline_demo``: ``cutline demo`` after its options are checked (coordinator/cli/demo.py)."""

import sys

from cutline_demo.demo import main

sys.exit(main())
