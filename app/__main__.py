import sys

from tokentrace.cli import main

sys.exit(main())
