#!/usr/bin/env python3
"""atheris target: harness.target_stream (see fuzz.py for flags and the oracle)."""

import sys

import fuzz

if __name__ == "__main__":
    fuzz.main("stream", sys.argv)
