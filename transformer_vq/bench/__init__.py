"""Benchmarks of the attention operators and the models: ``tvq bench op|train|decode``.

Every benchmark is a function returning a JSON-ready dict (machine, commit, versions and every figure); the command line
prints it as a table and writes the JSON file and PNG plots (``transformer_vq.bench.report``). Benchmarks are never part
of the test suite's assertions on time: tests only run them at tiny sizes and check the figures are there.
"""
