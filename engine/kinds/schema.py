"""The JSON Schema of a contract's `inputs:` block (torch-free: validate reads it)."""

from __future__ import annotations

from typing import Any

INPUTS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "anyOf": [{"required": ["tensors"]}, {"required": ["generator"]}],
    "properties": {
        "dims": {"type": "object", "additionalProperties": {
            "oneOf": [{"type": "integer", "minimum": 0},
                      {"type": "array", "minItems": 2, "maxItems": 3, "items": {"type": "integer", "minimum": 0},
                       "description": "[low, high] drawn per case, or [low, high, step]: low + step * k <= high"}]}},
        "tensors": {"type": "object", "minProperties": 1, "maxProperties": 16,
                    "additionalProperties": {"$ref": "#/$defs/tensor"}},
        "generator": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$"},
        "stream": {"type": "integer", "minimum": 0},
        "options": {"type": "object", "description": "free-form settings read by the named generator"},
    },
    "$defs": {
        "tensor": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "cycle": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/tensor"}},
                "shape": {"type": "array", "maxItems": 6, "items": {"oneOf": [
                    {"type": "integer", "minimum": 0}, {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}]}},
                "dist": {"enum": ["normal", "uniform", "signed", "constant", "integers"]},
                "mean": {"type": "number"}, "std": {"type": "number", "minimum": 0},
                "low": {"type": "number"}, "high": {"type": "number"}, "value": {"type": "number"},
                "around": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "maxItems": 4,
                                                          "items": {"type": "string"}}]},
                "values": {"type": "array", "maxItems": 4096, "description": "a literal tensor (nested lists)"},
                "log": {"type": "boolean", "description": "signed: |x| log-uniform in [low, high]"},
                "log_softmax": {"const": True, "description": "normalise the last dim into log-probabilities"},
                "scalar": {"type": "number", "description": "a Python float, not a tensor"},
                "omit": {"const": True, "description": "leave this keyword argument out (its default applies)"},
                "layout": {"enum": ["response", "full"]},
                "prompt_max": {"type": "integer", "minimum": 0},
                "hole_prob": {"type": "number", "minimum": 0, "maximum": 1},
                "empty_rows": {"type": "integer", "minimum": 0},
                "full_rows": {"type": "integer", "minimum": 0,
                              "description": "response layout: the last k rows run to the end (no padding)"},
                "dtype": {"enum": ["float", "bool", "long"]},
                "from_dim": {"type": "string", "description": "a Python int: this dim's value (+ plus)"},
                "plus": {"type": "integer"},
                "none": {"const": True, "description": "the argument is None in this case"},
                "zero_prob": {"type": "number", "minimum": 0, "maximum": 1,
                              "description": "each element is exactly 0 with this probability (after around)"},
            },
        }
    },
}
