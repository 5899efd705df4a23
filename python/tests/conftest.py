"""Shared fixtures: the repository's model fixtures and CLI snapshots, and
plans made once per session (planning takes a fraction of a second, but
the tests share them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

import autopar

#: The repository root: fixtures/ and snapshots/ are read from there.
REPO = Path(__file__).resolve().parents[2]

#: The issue's example model.
GPT = "gpt:layers=24,hidden=2048,heads=16,vocab=51200,seq=2048,dtype=bf16"


@pytest.fixture(scope="session")
def zoo_plan() -> autopar.Plan:
    """The issue's acceptance request."""
    return autopar.plan(GPT, cluster="dgx-h100", gpus=64, global_batch=512)


@pytest.fixture
def in_repo() -> Iterator[Path]:
    """Runs the test in the repository root, where the CLI's snapshots were
    made (a plan records its model argument as given)."""
    before = os.getcwd()
    os.chdir(REPO)
    try:
        yield REPO
    finally:
        os.chdir(before)
