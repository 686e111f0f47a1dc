"""``python -m easyr1 train config=...``: the ``easyr1`` command, where EasyR1's scripts run
``python3 -m verl.trainer.main config=...``."""

import sys

from easyr1.cli import main

sys.exit(main())
