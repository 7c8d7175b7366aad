import sys

from coordinator_free.cli import main

sys.exit(main())
