import sys

from unipar.cli.main import main

sys.exit(main())
