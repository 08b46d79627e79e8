"""Every AppTest starts with empty Streamlit caches and leaves no collector running."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import streamlit as st

from diagnostics import collector as collector_module


@pytest.fixture(autouse=True)
def clean_caches() -> Iterator[None]:
    st.cache_resource.clear()
    yield
    collector_module.stop_all()
    st.cache_resource.clear()
