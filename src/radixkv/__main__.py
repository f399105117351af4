from __future__ import annotations

import sys

from radixkv.cli import main

sys.exit(main())
