import sys
from pathlib import Path

# The harness and fakes are plain modules beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))
