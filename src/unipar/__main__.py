import sys

from unipar.cli.entry import main

sys.exit(main())
