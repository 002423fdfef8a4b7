#!/usr/bin/env python3
"""atheris target: harness.target_v1_open (see fuzz.py for flags and the oracle)."""

import sys

import fuzz

if __name__ == "__main__":
    fuzz.main("v1_open", sys.argv)
