"""factorize: exact balanced factorizations, and padded ones for embedding rows."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comera.shapes import factorize


@pytest.mark.parametrize("n,modes,expected", [
    (768, 3, (12, 8, 8)), (3072, 3, (16, 16, 12)), (768, 2, (32, 24)), (64, 3, (4, 4, 4)),
    (97, 2, (97, 1)), (1, 3, (1, 1, 1)), (12, 1, (12,))])
def test_exact_factorizations(n, modes, expected):
    assert factorize(n, modes) == expected


@given(n=st.integers(1, 200_000), modes=st.integers(1, 8))
@settings(max_examples=60, deadline=None)
def test_exact_product_and_order(n, modes):
    factors = factorize(n, modes)
    assert len(factors) == modes and math.prod(factors) == n
    assert list(factors) == sorted(factors, reverse=True)


@given(n=st.integers(2, 2_000_000), modes=st.integers(2, 8))
@settings(max_examples=60, deadline=None)
def test_padded_product_is_close_and_balanced(n, modes):
    factors = factorize(n, modes, allow_larger=True)
    assert len(factors) == modes and math.prod(factors) >= n
    root = n ** (1 / modes)
    assert max(factors) <= math.ceil(root) + 2 or math.prod(factors) == n


def test_paper_embedding_rows():
    factors = factorize(30522, 4, allow_larger=True)
    assert math.prod(factors) >= 30522
    assert math.prod(factors) <= 30522 * 1.01  # the paper pads to 32000; this stays within 1 %
    assert max(factors) / min(factors) < 1.5


def test_padding_prefers_exact_when_balanced():
    assert factorize(4096, 4, allow_larger=True) == (8, 8, 8, 8)


@pytest.mark.parametrize("n,modes", [(0, 2), (-3, 2), (5, 0), (2.5, 2), (True, 2)])
def test_bad_arguments(n, modes):
    with pytest.raises(ValueError, match="factorize"):
        factorize(n, modes)
