import sys

from workflow_engine.cli import main

sys.exit(main())
