#!/usr/bin/env python
"""Django's command-line utility for Runwarden."""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    from django.core.management import execute_from_command_line

    from dashboard.env import ConfigError

    try:
        execute_from_command_line(sys.argv)
    except ConfigError as error:
        sys.exit(f"runwarden: configuration error: {error}")


if __name__ == "__main__":
    main()
