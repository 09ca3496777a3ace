import sys

from unipar.cli import main

sys.exit(main())
