"""Rehearsals as declared steps (soarpack.steps) over bundle, serve and bench.

    check.py   `soarpack check`: the static checks and the rehearsal of prepare_env.sh / prepare_model.sh
    probes.py  the subprocesses check runs: sourcing prepare_env.sh, the overlay's imports, a CPython 3.10 install
    server.py  `soarpack rehearse-server`: serve a checkpoint as the platform does, eval a slice, bench, score
"""
