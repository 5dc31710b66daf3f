"""One encoder for results.json, repro.json and bench.json: what JSON cannot hold made explicit."""

from __future__ import annotations

import json
import math

import numpy as np
import torch

from attnlab.util.files import json_safe


def test_non_finite_values_stay_visible_as_strings_or_become_null():
    data = {"loss": math.nan, "peak": [math.inf, -math.inf], "ok": 1.5}
    assert json_safe(data) == {"loss": "nan", "peak": ["inf", "-inf"], "ok": 1.5}
    assert json_safe(data, non_finite_as_null=True) == {"loss": None, "peak": [None, None], "ok": 1.5}
    json.dumps(json_safe(data), allow_nan=False)  # strict JSON


def test_scalars_tuples_keys_and_rounding():
    data = {1: (np.float64(1 / 3), torch.tensor(2.0)), "n": np.int64(7)}
    assert json_safe(data) == {"1": [1 / 3, 2.0], "n": 7}
    assert json_safe(data, digits=3) == {"1": [0.333, 2.0], "n": 7}
