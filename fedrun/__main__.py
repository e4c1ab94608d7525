"""``python -m fedrun``: the same entry point as the ``fedrun`` console script."""
from fedrun.command.cli import main

if __name__ == "__main__":
    main()
