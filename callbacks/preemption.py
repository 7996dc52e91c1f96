"""Preemption: on SIGTERM or SIGINT, every rank saves at the same step boundary and the job stops cleanly.

Schedulers announce the end of a job with SIGTERM (Kubernetes, SLURM's ``scancel`` and preemption, spot/preemptible
VMs) and then, after a grace period, SIGKILL; a person at a terminal presses Ctrl+C (SIGINT). What happens:

1. The signal handler only records the signal (``signum``); nothing else is safe in a handler.
2. At each optimizer-step boundary (``on_train_batch_end`` after an optimizer step, every ``check_every_n_steps``
   steps) the ranks agree: under DDP they exchange the signal number with an ``all_reduce(MAX)`` on a **gloo** process
   group made for this in ``setup``, so the exchange is CPU-to-CPU and never waits on the GPU. It is asynchronous: the
   exchange started at one check is waited for at the next, by when it has long completed, so the hot loop holds no
   blocking collective and no host-device sync. Every rank starts and waits the same exchanges at the same steps,
   so every rank sees the same result and takes the same decision at the same step. One process needs no exchange
   and acts at the first boundary after the signal.
3. When a signal is agreed, every rank calls ``trainer.save_checkpoint`` (rank 0 writes; with
   :class:`~checkpoint_io.AtomicCheckpointIO` the file is replaced atomically) to ``<dir>/last.ckpt``, where ``<dir>``
   is ``dirpath`` if given, else the folder of the ``ModelCheckpoint`` that writes a file of that name (train.py's
   ``last_checkpoint``, or one with ``save_last``), else the trainer's first ``ModelCheckpoint``'s, else
   ``<default_root_dir>/checkpoints``. So the preemption checkpoint and the callback's latest one share one file,
   the one Lightning's ``--ckpt_path last`` looks for. Resume with ``--ckpt_path <dir>/last.ckpt`` (or ``last``
   where that folder is the same in every submission). The checkpoint is taken at
   the same point as a ``ModelCheckpoint(every_n_train_steps=...)`` one, which Lightning resumes from mid-epoch; the
   data module then serves the rest of the epoch exactly as the stopped run would have (datamodule.py).
4. The run then stops by raising :class:`PreemptedExit` (a ``SystemExit``) as soon as Lightning has logged the step:
   the step's other batch-end hooks run first, the module's ``on_train_batch_end`` among them (Lightning calls it
   after the callbacks'), so on a ``trainer.log_every_n_steps`` step its metrics row is logged as it would have been
   (the exit comes from Lightning's ``update_train_step_metrics``, shadowed for this; where a Lightning lacks it, at
   the next hook this callback gets: the next batch's start, a validation's start or the epoch's end). The
   checkpoint callbacks (:class:`~callbacks.resumable_checkpoint.ResumableCheckpoint`) save nothing more at this
   step. Then no validation, no epoch-end hooks, no further checkpoints, no next batch (``trainer.should_stop`` would
   run a validation first and make ``ModelCheckpoint`` save a stale top-k file at the epoch end: time a preempted job
   does not have). Lightning tears the trainer down (loggers are finalized with status ``failed``, writing what they
   hold: the run did not finish) and the process exits.
   Exception: **the epoch's last step.** Lightning 2.6 resumes a checkpoint of an epoch's last batch as a finished
   epoch (``FitLoop.reset``), so the resumed run would never validate that epoch, save its best checkpoint or run its
   end hooks. There the checkpoint is saved (a kill during what follows resumes from it, as before), the epoch ends
   as usual (validation, epoch-end checkpoints: ``last.ckpt`` is then the epoch end's), and the run stops at the first
   step boundary of the next epoch, or ends with status 0 if that epoch was its last. It costs the grace period a
   validation, the epoch-end saves and one step.

**Before the first optimizer step** (a signal during start-up, the sanity check or the first accumulation window) a
single process stops at the next batch's start, a sanity-check batch too, and saves nothing: nothing has trained, and
a resumed run's checkpoint still holds it all, while the sanity check and a first step with its compile could outlast
a scheduler's grace period. Under DDP the ranks agree on it at each training batch's start until the first optimizer
step (a blocking exchange on the gloo group, which only the first step's micro-batches make), so they stop together
before the first step; a signal during the sanity check stops them at the first training batch's start, a signal
during the first step's last micro-batch at a step boundary, as any later one.

**Exit status: 128 + signal number** (143 for SIGTERM, 130 for SIGINT), the shell convention for "ended by this
signal", rather than 0. A preempted run has not finished, and whatever supervises it must be able to tell: a
Kubernetes Job counts exit 0 as success and never reruns it (a ``podFailurePolicy`` can match 143 instead); a SLURM
``afterok`` dependency or a ``until python train.py ...; do :; done`` retry loop would treat 0 as done; torchrun
restarts failed workers, not successful ones. Exception: ranks that Lightning's own launcher started (local ranks
> 0 without torchrun or SLURM) exit 0, because that launcher SIGKILLs the whole job as soon as it sees a child exit
non-zero; their rank 0, whose status is the job's, exits 128 + signal number after waiting for them. Under DDP a rank
that got no signal itself exits with the status of the signal the ranks agreed on. A second SIGINT while a stop is
pending aborts at once (``KeyboardInterrupt``, Lightning's interrupt path, status 1); a repeated SIGTERM is ignored
(schedulers may send it more than once; the grace period's SIGKILL remains the hard stop).

**Why this replaces Lightning's own SIGTERM handling** (pytorch_lightning 2.6, ``signal_connector.py`` and
``loops/training_epoch_loop.py``): Lightning's handler runs ``dist.broadcast`` inside the signal handler (a collective
issued at a random point of rank 0's program, matched with whatever the other ranks do), then raises at the next step
without saving anything, and exits 0. Worse, under DDP its training loop broadcasts a "sigterm" tensor from rank 0
*every training step* and reads it with ``.item()`` (``_broadcast_sigterm_tensor``): a host-device sync per step that
stalls the CPU until the GPU has drained, so the host can never run ahead of the GPU (Lightning issue #21487). For
the duration of ``fit`` this callback puts its own handler in the place of Lightning's notifier and a no-op in the
place of the per-step broadcast (instance attributes that shadow the two methods, removed at teardown or on an
exception). Lightning's registered SIGTERM handler then calls ours from the moment it is registered. The other
signals (SIGINT, ...) get our handler in ``on_sanity_check_start``/``on_train_start``, the first hooks after Lightning
has registered its handlers: Lightning restores the handlers it found at registration when fit ends, also after an
exception, so ours must not be among them. If a future Lightning renames its notifier, the callback warns and installs
its SIGTERM handler the same way, over Lightning's.

**A rank that dies or hangs** is a different failure, which this callback cannot fix but must not make worse. With
gloo, a dead peer's closed connections fail the next collective at once; a hung rank (and with NCCL, which does not
notice a dead peer, a dead one too) blocks the others in their next collective until the process group's timeout:
30 minutes with Lightning's ``DDPStrategy`` default, for NCCL too (it passes torch's generic default, not NCCL's
10 minutes). Bound that wait with the DDP timeout (``--trainer.strategy
pytorch_lightning.strategies.DDPStrategy --trainer.strategy.timeout 0:05:00``); the gloo group here uses the same
timeout. NCCL's watchdog then waits 4 x ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` (a minute by default) for its debug
dump before it ends the process (measured on two H200s: 75 s from the kill to the exit with a 15 s timeout). When
rank 0 of Lightning's own launcher fails, its child ranks would stay behind, blocked until their own timeout:
:meth:`PreemptionHandler.on_exception` kills them (as torchrun does with the workers of a failed job).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from lightning_fabric.plugins.environments import LightningEnvironment
from pytorch_lightning.callbacks import Callback, ModelCheckpoint, Timer
from pytorch_lightning.callbacks.timer import Interval
from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from pytorch_lightning.utilities.rank_zero import rank_prefixed_message
from typing_extensions import override  # a dependency (pyproject.toml); Lightning marks its hooks with it

from callbacks.ranges import checkpoint_range
from ddp_groups import new_gloo_group

#: Signals that cannot be caught.
_UNCATCHABLE = {"SIGKILL", "SIGSTOP"}
#: What the ranks agree on when a rank's ``trainer.max_time`` ran out and none got a signal (which outranks it).
_TIME_IS_UP = -1


class PreemptedExit(SystemExit):
    """Raised on every rank at the step boundary where the ranks agreed to stop; ``code`` is the exit status."""


def _no_sigterm_broadcast() -> None:
    """Stands in for Lightning's per-step sigterm broadcast while this callback owns the signal."""


class PreemptionHandler(Callback):
    """Saves a checkpoint and stops all ranks at the same step boundary on SIGTERM or SIGINT (see module docstring).

    Args:
        signals: Names of the signals that trigger a checkpoint-and-stop (``SIGTERM``, ``SIGINT``, ``SIGUSR1``, ...).
        check_every_n_steps: Look at (and under DDP, exchange) the signal flag every this many optimizer steps. The
            exchange is asynchronous, so 1 costs next to nothing; a larger value only delays the stop: by up to N
            steps on one process, up to 2N under DDP (an exchange started at one check is read at the next). Size
            2N steps well inside the scheduler's grace period.
        dirpath: Folder of the checkpoint; ``None`` uses the folder of the ``ModelCheckpoint`` whose file has
            ``filename`` (train.py's ``last_checkpoint``), else the first ``ModelCheckpoint``'s, else
            ``<default_root_dir>/checkpoints``.
        filename: Name of the checkpoint file in that folder (``last.ckpt``, what ``ModelCheckpoint`` calls its
            latest checkpoint and ``--ckpt_path last`` looks for).
        child_wait_s: After a stop, how long rank 0 of Lightning's own launcher waits for its child ranks to exit
            before exiting itself.

    Attributes:
        exit_code: ``None`` until the run is stopped by a signal, then the status the process exits with.
        stopped_at_step: The global step at which the checkpoint was saved, or ``None``.
        checkpoint_path: Where it was saved, or ``None``.
    """

    def __init__(
        self,
        signals: list[str] = ["SIGTERM", "SIGINT"],  # noqa: B006 (jsonargparse needs a plain default)
        check_every_n_steps: int = 1,
        dirpath: str | None = None,
        filename: str = "last.ckpt",
        child_wait_s: float = 60.0,
    ) -> None:
        super().__init__()
        valid = sorted(s.name for s in signal.valid_signals() if isinstance(s, signal.Signals))
        valid = [name for name in valid if name not in _UNCATCHABLE]
        if not signals:
            raise ValueError(f"preemption.signals must name at least one signal; valid: {', '.join(valid)}")
        for name in signals:
            if name not in valid:
                raise ValueError(f"preemption.signals: {name!r} is not a signal that can be caught; valid: {valid}")
        if check_every_n_steps < 1:
            raise ValueError(f"preemption.check_every_n_steps must be >= 1, got {check_every_n_steps}")
        if not filename or os.sep in filename or (os.altsep and os.altsep in filename):
            raise ValueError(f"preemption.filename must be a plain file name like 'last.ckpt', got {filename!r}")
        if not 0 <= child_wait_s < math.inf:  # NaN too: a wait without a limit
            raise ValueError(f"preemption.child_wait_s must be a number of seconds >= 0, got {child_wait_s}")
        self.signals = [signal.Signals[name] for name in signals]
        self.check_every_n_steps = check_every_n_steps
        self.dirpath = dirpath
        self.filename = filename
        self.child_wait_s = child_wait_s
        self.exit_code: int | None = None
        self.stopped_at_step: int | None = None
        self.checkpoint_path: str | None = None
        self._signum = 0  # the first signal this process received; written by the handler only
        self._announced = False
        self._original_handlers: dict[signal.Signals, Any] = {}  # before Lightning's and ours
        self._shadowed: list[tuple[Any, str]] = []  # (object, attribute) of Lightning internals turned off
        self._group: Any = None  # the gloo process group of the flag exchange under DDP
        self._pending: tuple[Any, torch.Tensor] | None = None  # exchange started at the last check
        self._step_before_batch: int | None = None  # global_step when the current training batch started
        self._owns_sigterm = False  # whether Lightning's SIGTERM notifier calls our handler instead
        self._stop_at_next_step = 0  # a signal agreed on at an epoch's last step: the stop waits for the epoch's end
        self._exit_pending = False  # saved and stopped: PreemptedExit once Lightning has logged the step
        self._stepped = False  # this fit has taken an optimizer step (before one, a stop saves nothing)
        self._timer: Timer | None = None  # Lightning's max_time timer, whose per-step broadcast this replaces (DDP)
        self._time_is_up = False  # this rank's timer ran out (the ranks agree on it with the signal flag)

    # --- the signal handler ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._signum:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl+C: abort now
            return  # a repeated SIGTERM: the stop is already under way
        self._signum = signum

    def _install_handlers(self) -> None:
        """Installs the handler for the signals Lightning does not route to it (all but SIGTERM, normally)."""
        if threading.current_thread() is not threading.main_thread():
            return  # Python only lets the main thread set handlers; warned about in setup
        for signum in self.signals:
            if not (signum == signal.SIGTERM and self._owns_sigterm):
                signal.signal(signum, self._on_signal)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._original_handlers.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._original_handlers = {}

    def _shadow(self, obj: Any, name: str, replacement: Any) -> bool:
        if obj is None or not callable(getattr(obj, name, None)):
            return False
        setattr(obj, name, replacement)
        self._shadowed.append((obj, name))
        return True

    def _unshadow(self) -> None:
        for obj, name in self._shadowed:
            obj.__dict__.pop(name, None)
        self._shadowed = []

    # --- Lightning hooks ------------------------------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.exit_code = self.stopped_at_step = self.checkpoint_path = None
        self._signum, self._announced, self._pending, self._step_before_batch = 0, False, None, None
        self._stop_at_next_step, self._exit_pending, self._stepped = 0, False, False
        self._timer, self._time_is_up = None, False  # an earlier fit's max_time ran out: not this one's
        if threading.current_thread() is not threading.main_thread():
            rank_zero_warn("PreemptionHandler: fit does not run in the main thread, where signals are handled")
        # Lightning installs its signal handlers after setup and restores the ones it found at teardown, also after
        # an exception (when no teardown hook runs); so the handlers are installed after Lightning's (see
        # _install_handlers) and what is restored is what was there before either.
        self._original_handlers = {signum: signal.getsignal(signum) for signum in self.signals}
        self._owns_sigterm = False
        if signal.SIGTERM in self.signals:
            # Lightning's SIGTERM handler calls its notifier, looked up on the instance when it is registered: with
            # ours in its place, a SIGTERM is ours from the moment Lightning registers. Either way Lightning's
            # notifier never runs, so the per-step broadcast of what it would have noted can go.
            connector = getattr(trainer, "_signal_connector", None)
            self._owns_sigterm = self._shadow(connector, "_sigterm_notifier_fn", self._on_signal)
            if not self._owns_sigterm:
                rank_zero_warn(
                    "PreemptionHandler: Lightning's SIGTERM notifier was not found (Lightning internals changed); "
                    "the preemption handler replaces Lightning's SIGTERM handler when training starts"
                )
            if not self._shadow(trainer.fit_loop.epoch_loop, "_broadcast_sigterm_tensor", _no_sigterm_broadcast):
                rank_zero_info("PreemptionHandler: this Lightning has no per-step sigterm broadcast to turn off")
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            self._group = new_gloo_group(trainer)  # its exchanges bounded by the DDP strategy's timeout
            self._take_over_the_timer(trainer)

    def _take_over_the_timer(self, trainer: pl.Trainer) -> None:
        """``trainer.max_time``'s check, agreed with the signal flag instead of broadcast every step.

        Lightning's Timer broadcasts rank 0's "time is up" every training step: ``broadcast_object_list``, two
        blocking collectives, which under NCCL also read a size back from the GPU (``.item()``): a host sync per step,
        the one this handler removes for SIGTERM. Here each rank only notes whether its time is up; the asynchronous
        exchange of the signal flag carries it, and every rank stops at the step where they agree (a check later than
        Lightning would: at most ``2 x check_every_n_steps`` steps, a fraction of a second).
        """
        timer = _max_time_timer(trainer)
        if timer is None or timer._interval != Interval.step:
            return  # no max_time, or checked once an epoch: a broadcast there costs nothing
        self._timer = timer

        def note_time(trainer: pl.Trainer) -> None:
            self._time_is_up = timer.time_elapsed() >= timer._duration

        self._shadow(timer, "_check_time_remaining", note_time)

    @override
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install_handlers()  # the first hook after Lightning registered its handlers

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install_handlers()  # the first hook after Lightning registered its handlers without sanity check

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After Lightning restored the callbacks' states, before the Timer's own check there (it comes after this
        # callback), which would end the fit unseen.
        self._refuse_a_spent_time_budget(trainer)

    @staticmethod
    def _refuse_a_spent_time_budget(trainer: pl.Trainer) -> None:
        """``trainer.max_time`` counts over every resume (the Timer's state is in the checkpoint): restored past it,
        Lightning would train nothing and end with status 0, which a requeue loop takes for a finished job. train.py
        refuses a checkpoint file at parse time; this covers ``--ckpt_path last``, resolved by Lightning later."""
        timer = _max_time_timer(trainer)
        if timer is None or timer.time_elapsed() < timer._duration:
            return
        raise ValueError(
            f"trainer.max_time {timedelta(seconds=int(timer._duration))} is spent: the checkpoint this run resumes has "
            f"trained for {timedelta(seconds=int(timer.time_elapsed()))}, counted over every resume, so nothing "
            "would train; raise trainer.max_time by the time this submission may take"
        )

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if trainer.sanity_checking:
            self._stop_before_training(trainer)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._stop_before_training(trainer, exchange=True)
        self._exit_if_stopped()
        self._step_before_batch = trainer.global_step

    def _announce(self, trainer: pl.Trainer, what: str) -> None:
        """``received SIGNAL<what>`` on stderr with the rank, once. Printed from a hook, not in the handler: a handler
        that writes to a stream it interrupted can fail."""
        self._announced = True
        message = f"received {signal.Signals(self._signum).name}{what}"
        print(rank_prefixed_message(message, trainer.global_rank), file=sys.stderr, flush=True)

    def _stop_before_training(self, trainer: pl.Trainer, exchange: bool = False) -> None:
        """A signal before this fit's first optimizer step: stop now, saving nothing. Nothing has trained since the
        start (a resumed run's checkpoint still holds it all), and the sanity check and a first step (minutes with a
        first compile) would only delay the stop past a scheduler's grace period.

        One process stops at the next batch's start, a sanity-check batch's too. Under DDP the ranks agree first, at
        the start of each training batch before the first optimizer step (``exchange``): a blocking exchange of the
        signal flag on the gloo group, a few CPU collectives in all (one per micro-batch of the first step), where
        nothing is queued on the GPU yet. Every rank runs the same training batches, so every rank exchanges alike
        and stops at the same batch; not so the sanity check, whose validation shards are not padded (a rank may
        check fewer batches), so a signal there stops the ranks at the first training batch's start.
        """
        if self._stepped or self._exit_pending:
            return
        signum = self._signum
        if trainer.world_size > 1:
            if not exchange or self._group is None:
                return
            flag = torch.tensor([signum], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)  # every rank: the same signal
            signum = int(flag.item())  # a CPU tensor: no device sync
        if not signum:
            return
        if self._signum:
            self._announce(
                trainer,
                " before the first training step: nothing trained in this run, nothing saved; stopping (exit status "
                f"{128 + signum})",
            )
        # A child rank of Lightning's own launcher exits 0 (see the module docstring): rank 0 has the job's status.
        self.exit_code = 0 if _is_lightning_child(trainer) else 128 + signum
        raise PreemptedExit(self.exit_code)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._exit_if_stopped()  # a validation due at the stop's step (val_check_interval) does not run

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._exit_if_stopped()  # the stop's step ended the epoch (max_steps): no epoch-end hooks, no validation

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        self._stepped = self._stepped or step != self._step_before_batch
        if step == self._step_before_batch:
            # Still accumulating gradients: not an optimizer-step boundary. Judged by this batch alone (not by the
            # last batch end seen), so the first micro-batch after a start or a resume does not count as one either:
            # a checkpoint there would lose its gradient.
            return
        if self._signum and not self._announced:
            self._announce(trainer, ": saving a checkpoint and stopping at a step boundary all ranks agree on")
        if self._exit_pending:
            return
        if self._stop_at_next_step:
            signum, self._stop_at_next_step = self._stop_at_next_step, 0
            self._stop(trainer, signum)  # the first step after the epoch's end
            return
        if step % self.check_every_n_steps:
            return
        agreed = self._agreed_signal()
        if agreed == _TIME_IS_UP:
            # max_time (see _take_over_the_timer): Lightning's own stop, on every rank at this step.
            if not trainer.should_stop and self._timer is not None:
                elapsed = timedelta(seconds=int(self._timer.time_elapsed()))
                rank_zero_info(f"Time limit reached (trainer.max_time). Elapsed time is {elapsed}; stopping.")
            trainer.should_stop = True
            return
        if agreed and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            # Lightning 2.6 resumes a checkpoint of an epoch's last batch as a finished epoch: the epoch's validation,
            # its best checkpoint and its end hooks would never run. So they run now, and the run stops at the next
            # step (or ends, if this was its last epoch). The checkpoint saved here covers a kill meanwhile; the
            # epoch-end last.ckpt replaces it. Every rank sees the same last batch, so every rank waits alike.
            self._save(trainer, agreed)
            rank_zero_info("preemption: the epoch's last step: stopping after its validation and checkpoints")
            self._stop_at_next_step = agreed
        elif agreed:
            self._stop(trainer, agreed)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # No wait on a pending exchange here: after a failure, peers may never complete it.
        self._pending = None
        self._unshadow()
        self._restore_handlers()
        launcher = trainer.strategy.launcher
        procs: list[subprocess.Popen] = launcher.procs if isinstance(launcher, _SubprocessScriptLauncher) else []
        if isinstance(exception, PreemptedExit):
            # The job's status is rank 0's: make it mean that every rank has stopped.
            for proc in procs:
                try:
                    proc.wait(timeout=self.child_wait_s)
                except subprocess.TimeoutExpired:
                    rank_zero_warn(f"PreemptionHandler: child rank (pid {proc.pid}) still running after the stop")
        elif not isinstance(exception, KeyboardInterrupt):  # Lightning itself kills the children on Ctrl+C
            # This rank failed; its children would block in their next collective until the DDP timeout.
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self._pending is not None:
            # Every rank started this exchange, so it completes; waiting lets the group go down cleanly.
            self._pending[0].wait()
            self._pending = None
        if self._group is not None:
            dist.destroy_process_group(self._group)
            self._group = None
        self._unshadow()
        self._restore_handlers()

    # --- agreement and stop ---------------------------------------------------------------------------
    def _agreed_signal(self) -> int:
        """The signal all ranks agree to stop on at this check (0: carry on; :data:`_TIME_IS_UP`: a rank's max_time
        ran out and none got a signal); the same value on every rank."""
        if self._group is None:
            return self._signum
        agreed = 0
        if self._pending is not None:
            work, flag = self._pending
            self._pending = None
            work.wait()
            exchanged = int(flag.item())  # a CPU tensor: no device sync
            agreed = exchanged // 2 or (_TIME_IS_UP if exchanged else 0)
        if not agreed or agreed == _TIME_IS_UP:
            # 2 x signal + time-out: the MAX over the ranks is a signal if any rank got one (a preempted job saves and
            # goes), else 1 if any rank's max_time ran out.
            flag = torch.tensor([2 * self._signum + int(self._time_is_up)], dtype=torch.int32)
            work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
            self._pending = (work, flag)
        return agreed

    def _checkpoint_folder(self, trainer: pl.Trainer) -> tuple[Path, ModelCheckpoint | None]:
        """The folder of the checkpoint and the ``ModelCheckpoint`` whose folder it is (``None``: no callback's)."""
        if self.dirpath is not None:
            return Path(self.dirpath), None
        callbacks = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.dirpath]
        # The folder of the callback that writes the file this handler writes (train.py's last_checkpoint: last.ckpt;
        # a save_last callback: last.ckpt): where a requeued job's --ckpt_path last finds the newest of the two. The
        # first checkpoint callback's folder may be another one, even a new version_N folder in every submission.
        for callback in callbacks:
            if self._writes_its_file(callback) or self._writes_its_last_file(callback):
                return Path(callback.dirpath), callback
        callback = trainer.checkpoint_callback
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath), callback
        return Path(trainer.default_root_dir) / "checkpoints", None

    def _writes_its_file(self, callback: ModelCheckpoint) -> bool:
        """Whether ``callback`` names its (unmonitored) checkpoint as this handler does (train.py's last_checkpoint)."""
        return callback.monitor is None and f"{callback.filename}{callback.FILE_EXTENSION}" == self.filename

    def _writes_its_last_file(self, callback: ModelCheckpoint) -> bool:
        """Whether ``callback``'s ``save_last`` file has this handler's name (Lightning's last.ckpt)."""
        return bool(callback.save_last) and self.filename == callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION

    def _save(self, trainer: pl.Trainer, signum: int) -> Path:
        folder, callback = self._checkpoint_folder(trainer)
        path = folder / self.filename
        # Recorded in the checkpoint as the callback's own file, as if the callback had saved it, so a resumed run's
        # ModelCheckpoint overwrites it rather than starting last-v1.ckpt next to it.
        if callback is not None and self._writes_its_file(callback):
            callback.best_model_path = str(path)
        elif callback is not None and self._writes_its_last_file(callback):
            callback.last_model_path = str(path)
        name = signal.Signals(signum).name
        rank_zero_info(f"preemption: {name}: saving {path} at step {trainer.global_step}")
        # The full training state; every rank calls it (it ends with a barrier), rank 0 writes.
        with checkpoint_range():
            trainer.save_checkpoint(path, weights_only=False)
        self.checkpoint_path = str(path)
        return path

    def _stop(self, trainer: pl.Trainer, signum: int) -> None:
        """Saves, and exits once Lightning has logged the step (see the module docstring, item 4)."""
        path = self._save(trainer, signum)
        self.stopped_at_step = trainer.global_step
        self.exit_code = 0 if _is_lightning_child(trainer) else 128 + signum
        rank_zero_info(
            f"preemption: stopped at step {trainer.global_step}; resume with --ckpt_path {path} "
            f"(exit status {128 + signum})"
        )
        self._exit_pending = True
        connector = getattr(trainer, "_logger_connector", None)
        log_the_step = getattr(connector, "update_train_step_metrics", None)
        if callable(log_the_step):

            def log_the_step_then_exit() -> None:
                log_the_step()
                self._exit_if_stopped()

            self._shadow(connector, "update_train_step_metrics", log_the_step_then_exit)

    def stops_at(self, trainer: pl.Trainer) -> bool:
        """Whether this callback saved at this step and the run exits after it: nothing else need save here."""
        return self._exit_pending and self.stopped_at_step == trainer.global_step

    def _exit_if_stopped(self) -> None:
        if self._exit_pending:
            self._exit_pending = False
            raise PreemptedExit(self.exit_code)


def _max_time_timer(trainer: pl.Trainer) -> Timer | None:
    """Lightning's Timer of ``trainer.max_time``, or ``None`` when the run has no time limit."""
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    return timer if timer is not None and timer._duration is not None else None


def _is_lightning_child(trainer: pl.Trainer) -> bool:
    """Whether this process is a rank > 0 that Lightning's own launcher started (not torchrun, not SLURM)."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    return (
        isinstance(environment, LightningEnvironment)
        and environment.creates_processes_externally
        and trainer.local_rank > 0
    )


class WorkerSignalShield:
    """``worker_init_fn`` for DataLoader workers: they leave SIGINT and SIGTERM to the main process.

    Ctrl+C sends SIGINT to the whole foreground process group, and SLURM signals every process of a job step, so the
    workers get the stop signal too. Left alone, a worker ends on it (SIGTERM kills it; on SIGINT torch's worker loop
    returns), the main process fails with "DataLoader worker ... killed by signal" or "exited unexpectedly" on its
    next fetch, and the checkpoint at the agreed step never happens. With the shield a worker ignores SIGINT, and
    obeys SIGTERM only from the main process, which uses it to terminate its workers at exit (multiprocessing's
    ``terminate()`` and torch's shutdown); a SIGTERM from anyone else is ignored. The sender is told apart by a
    thread that waits for SIGTERM with ``sigwaitinfo`` (SIGTERM is blocked for the worker's other threads); where
    the platform lacks it (macOS), SIGTERM keeps its default.

    Args:
        inner: A ``worker_init_fn`` to run after the shield is up (e.g. Lightning's worker seeding).
    """

    def __init__(self, inner: Callable[[int], None] | None = None) -> None:
        self.inner = inner
        self.main_pid = os.getpid()  # made in the main process; a worker's parent may be a forkserver instead

    def __call__(self, worker_id: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # A forked worker inherits the main process's Python handlers (the preemption handler among them); a worker
        # has no use for them, and the default action is what the main process's terminate() expects.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if hasattr(signal, "sigwaitinfo") and hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            threading.Thread(target=self._obey_main_process, daemon=True, name="sigterm-from-main").start()
        if self.inner is not None:
            self.inner(worker_id)

    def _obey_main_process(self) -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == self.main_pid:
                # End the way the default action would have: "killed by SIGTERM". This thread is the only one that
                # does not block the signal once it unblocks it, so the signal is delivered here, at once.
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                os.kill(os.getpid(), signal.SIGTERM)
                os._exit(128 + signal.SIGTERM)  # not reached
