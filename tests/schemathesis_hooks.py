"""Loaded by schemathesis (SCHEMATHESIS_HOOKS) in tests/test_openapi.py.

Python 3.11.7's `ast.parse` can raise `SystemError: AST constructor recursion
depth mismatch` deep in a stack (a CPython bug, fixed in 3.11.8), and hypothesis
parses schemathesis' sources with it only to name a filter's lambda in a repr. A
name is not worth a failed run: there, such an error gives the generic name."""

import hypothesis.internal.lambda_sources as lambda_sources

_describe = lambda_sources._lambda_description


def _lambda_description(f, *args, **kwargs):
    try:
        return _describe(f, *args, **kwargs)
    except SystemError:
        return "lambda: <unknown>"


lambda_sources._lambda_description = _lambda_description
