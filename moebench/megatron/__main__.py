"""python -m moebench.megatron"""
import sys

from .. import cli
from .tool import main

sys.exit(cli.run(main, "moebench.megatron"))
