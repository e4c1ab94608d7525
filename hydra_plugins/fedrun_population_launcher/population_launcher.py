"""``hydra/launcher=population``: a sweep's runs trained together, one population per group.

``fedrun -m seed=0,1,2,3 aggregator=fedavg,fednnnn hydra/launcher=population`` composes every job
of the sweep, groups the jobs that can share one batched training call (the same prepared data,
model architecture, device and batched-engine settings: :func:`group_key`), and trains each group
as one population (:func:`fedrun.harness.simulation.simulate_runs`).  A job that fits no group (the
sequential engine, a group of one) runs as it would under Hydra's basic launcher.  Run
directories, CSVs, checkpoints and summaries are those of the jobs run one by one; failed jobs are
recorded and listed at the end as with any launcher.

Hydra imports every plugin at start-up, in any program: this module imports fedrun (and torch)
only when it launches.
"""
# No `from __future__ import annotations`: Hydra's plugin scan executes this module before it is
# in sys.modules, where dataclasses would look its string annotations up.
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

log = logging.getLogger("fedrun.launcher")


@dataclass
class PopulationLauncherConf:
    _target_: str = "hydra_plugins.fedrun_population_launcher.population_launcher.PopulationLauncher"
    # At most this many runs in one population; a larger group is split in order (null: no limit).
    max_runs: Optional[int] = None


ConfigStore.instance().store(group="hydra/launcher", name="population", node=PopulationLauncherConf,
                             provider="fedrun")


@dataclass
class Job:
    """One job of the sweep: its number, command-line overrides and composed config (Hydra's
    part included, with the job's output directory resolved)."""

    num: int
    overrides: Sequence[str]
    config: DictConfig

    @property
    def run_dir(self) -> Path:
        return Path(self.config.hydra.runtime.output_dir)

    def task_config(self) -> DictConfig:
        cfg = OmegaConf.create(OmegaConf.to_container(self.config, resolve=False))
        with read_write(cfg), open_dict(cfg):
            del cfg["hydra"]
        return cfg


class PopulationLauncher(Launcher):
    def __init__(self, max_runs: Optional[int] = None) -> None:
        super().__init__()
        self.max_runs = max_runs
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from fedrun.errors import ConfigError

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        if self.max_runs is not None and (not isinstance(self.max_runs, int) or self.max_runs < 1):
            raise ConfigError("hydra.launcher.max_runs", self.max_runs, "must be an integer >= 1 or null")
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info("Launching %d jobs as populations", len(job_overrides))
        jobs = []
        for n, overrides in enumerate(job_overrides):
            num = initial_job_idx + n
            log.info("\t#%d : %s", num, " ".join(filter_overrides(overrides)))
            jobs.append(self._job(num, overrides))
        populations, alone = plan(jobs, self.max_runs)
        returns: dict[int, JobReturn] = {}
        for group in populations:
            returns.update(self._population(group))
        for job, why in alone:
            log.info("job %d runs alone: %s", job.num, why)
            returns[job.num] = self._alone(job)
        return [returns[job.num] for job in jobs]

    def _job(self, num: int, overrides: Sequence[str]) -> Job:
        """The job's config as Hydra's ``run_job`` makes it: ids set, output directory resolved."""
        config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(config):
            config.hydra.job.id = num
            config.hydra.job.num = num
        saved = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(config)
        try:
            out = os.path.join(str(OmegaConf.select(config, "hydra.sweep.dir")),
                               str(OmegaConf.select(config, "hydra.sweep.subdir")))
            with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
                config.hydra.runtime.output_dir = os.path.abspath(out)
        finally:
            HydraConfig.instance().cfg = saved
        return Job(num, list(overrides), config)

    def _alone(self, job: Job) -> JobReturn:
        """The job as Hydra's basic launcher runs it."""
        ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=job.config,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return ret

    def _population(self, group: list[Job]) -> dict[int, JobReturn]:
        """Build every job's run (a job whose settings are refused fails alone), train the runs
        together, and turn each run's summary or error into its job's return."""
        import torch

        from fedrun.command import build
        from fedrun.harness.objective import objective
        from fedrun.errors import FedrunError, Interrupted, exit_with
        from fedrun.harness.simulation import simulate_runs

        callbacks = self.hydra_context.callbacks
        datasets: dict = {}
        runs, members, returns = [], [], {}
        progress = False
        for job in group:
            cfg = job.task_config()
            callbacks.on_job_start(config=job.config, task_function=self.task_function)
            try:
                choices = OmegaConf.to_container(job.config.hydra.runtime.choices)
                runs.append(build.federated_run(cfg, job.run_dir, choices, list(job.config.hydra.overrides.task),
                                                datasets, batched=True))
                members.append((job, cfg))
                progress = progress or bool(cfg.progress)
            except FedrunError as e:
                returns[job.num] = self._failed(job, cfg, e)
        if runs:
            configure_log(members[0][0].config.hydra.job_logging, self.config.hydra.verbose)  # fedrun's format
            log.info("population of %d runs (jobs %s): dataset=%s, model=%s", len(runs),
                     ", ".join(str(job.num) for job, _ in members), members[0][1].dataset.name,
                     job_choice(members[0][0], "model"))
            threads = members[0][1].threads
            if threads is not None:  # one process trains them all: the first job's setting
                torch.set_num_threads(threads)
            try:
                outcomes = simulate_runs(runs, progress=progress)
            except Interrupted as e:
                exit_with(e, e.exit_code)
            for (job, cfg), outcome in zip(members, outcomes):
                if isinstance(outcome, FedrunError):
                    returns[job.num] = self._failed(job, cfg, outcome)
                    continue
                returns[job.num] = self._return(job, cfg, JobStatus.COMPLETED,
                                                objective(outcome, job.run_dir, cfg.objective))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns

    def _failed(self, job: Job, cfg: DictConfig, error) -> JobReturn:
        """A failed job, noted where the command lists it at the end of the sweep (:mod:`fedrun.command.sweeps`)."""
        from fedrun.command.sweeps import job_failed

        failed = job_failed(Path(str(self.config.hydra.sweep.dir)), job.num, job.run_dir, error)
        return self._return(job, cfg, JobStatus.FAILED, failed)

    def _return(self, job: Job, cfg: DictConfig, status: JobStatus, value) -> JobReturn:
        ret = JobReturn(overrides=list(job.config.hydra.overrides.task), cfg=cfg, hydra_cfg=job.config,
                        working_dir=os.getcwd(), task_name=str(job.config.hydra.job.name), status=status)
        ret.return_value = value
        self.hydra_context.callbacks.on_job_end(config=job.config, job_return=ret)
        return ret


def job_choice(job: Job, group: str) -> str:
    return str(OmegaConf.select(job.config, f"hydra.runtime.choices.{group}", default="?"))


def group_key(job: Job) -> tuple[str | None, str]:
    """What a job shares with the others of its population: the prepared data
    (:func:`fedrun.command.build.data_key`), the model's settings and the batched engine it builds
    (:func:`fedrun.client.engines.as_batched`: ``engine=auto`` and ``engine=batched`` with the same
    options train together); or None and the reason when it cannot join one."""
    from fedrun.command import build
    from fedrun.client import engines
    from fedrun.errors import FedrunError

    cfg = job.task_config()
    try:
        objects = build.build(cfg)
        data = build.data_key(cfg)
    except FedrunError as e:
        return None, f"its settings are refused ({e})"
    batched = engines.as_batched(objects["engine"])
    if batched is None:
        return None, f"engine={job_choice(job, 'engine')} (a population trains on the batched engine)"
    model = build.resolved(cfg)["model"]
    return json.dumps({"data": data, "model": model, "engine": batched.keywords}, sort_keys=True, default=str), ""


def plan(jobs: list[Job], max_runs: int | None = None) -> tuple[list[list[Job]], list[tuple[Job, str]]]:
    """The sweep's populations (jobs of equal :func:`group_key`, in job order, at most
    ``max_runs`` each) and the jobs that run alone, with the reason."""
    groups: dict[str, list[Job]] = {}
    alone: list[tuple[Job, str]] = []
    for job in jobs:
        key, why = group_key(job)
        if key is None:
            alone.append((job, why))
        else:
            groups.setdefault(key, []).append(job)
    populations = []
    for members in groups.values():
        size = max_runs or len(members)
        for i in range(0, len(members), size):
            part = members[i : i + size]
            if len(part) == 1:
                alone.append((part[0], "no other job of the sweep shares its dataset, model and engine settings"))
            else:
                populations.append(part)
    alone.sort(key=lambda pair: pair[0].num)
    return populations, alone
