"""Plotly figures, one module per page (pure: history in, figure out).

:mod:`.live` (the live and replay panels), :mod:`.engines` (a data-parallel server's engines side
by side), :mod:`.diagnose` (the chart beside a finding), :mod:`.fleet`, :mod:`.probe`,
:mod:`.prediction` (the what-if's chart: the only one that imports the simulator), and
:mod:`.common` (what they share). Nothing is imported here, so drawing a live chart loads only
what the live charts need.
"""
