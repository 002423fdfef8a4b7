#!/usr/bin/env python3
"""atheris target: harness.target_load (see fuzz.py for flags and the oracle)."""

import sys

import fuzz

if __name__ == "__main__":
    fuzz.main("load", sys.argv)
