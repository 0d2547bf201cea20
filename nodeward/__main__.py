import sys

from nodeward.cli import main

sys.exit(main())
