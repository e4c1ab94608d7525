"""One run and many: the round loop (:mod:`.simulation`), a run (:mod:`.federated_run`), a
population trained together, the recorder of the CSVs, the run folder, provenance,
the objective a sweep reads, and the dashboards.
"""
