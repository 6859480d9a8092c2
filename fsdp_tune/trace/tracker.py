"""torch's FSDPMemTracker (live bytes by category: sharded and unsharded parameters, all-gather and reduce-scatter
buffers, activations, backward temporaries, gradients, optimizer state), keeping the peak of every phase of the
step rather than only the step's: the phases are what extrapolate linearly with the number of decoder layers.

A phase is where the step is: the forward or backward of the first, a middle or the last decoder layer, of the
input embedding, of what runs outside the layers before (the backbone's edges) and after them (TRL's fused head,
the loss), gradient clipping, the optimizer step. A middle layer's peak is the one nearest the deep end (its
memory grows with the layers before it), which is the same layer position at any depth >= 3.

While backward passes from one decoder layer to the next, both are in ModTracker's `parents` for a moment (the
next layer's pre-backward hook, where FSDP copies out its all-gathered parameters, fires before the previous
layer's post-backward hook): that moment is the layer backward has reached. `parents` is a set of names, whose
order follows the process's string hash seed (PYTHONHASHSEED, random per process): taking the first layer found
put those moments in one phase or the other from one process to the next, and at 3 layers in another phase than
at 4 under some seeds, a difference the extrapolation multiplies by the layers not traced. CI's 405B trace at 512
ranks (210.7 GiB against a plan of 22.0; PYTHONHASHSEED=3 gives it in a fresh process) was layer 0's copy-out
counted in its own backward at 4 layers and in layer 1's at 3.

Two fixes to the tracker's assumptions, both from the trace's own runs: a module whose forward never runs (TRL's
fused head reads lm_head's weight with `full_tensor()`, so lm_head's forward hooks never fire) has no stats, and
the tracker's backward instrumentation would fail on it; its group keeps FSDP's own hooks there. Under
cpu_offload the sharded parameters and gradients and the optimizer state live in host memory: the device total
leaves them out."""

from __future__ import annotations

from functools import wraps

from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType, _FSDPState

from fsdp_tune.trace.step import REFERENCE

TOTAL = "Total"
HOST_WHEN_OFFLOADED = (_FSDPRefType.SHARDED_PARAM, _FSDPRefType.SHARDED_GRAD, _FSDPRefType.OPT)
CATEGORY = {  # the tracker's categories, as the trace reports them
    _FSDPRefType.SHARDED_PARAM: "sharded parameters",
    _FSDPRefType.UNSHARDED_PARAM: "unsharded parameters (gathered units)",
    _FSDPRefType.ALL_GATHER: "all-gather buffers",
    _FSDPRefType.REDUCE_SCATTER: "reduce-scatter buffers",
    _FSDPRefType.SHARDED_GRAD: "sharded gradients",
    _FSDPRefType.UNSHARDED_GRAD: "unsharded gradients",
    _FSDPRefType.OPT: "optimizer state",
    _FSDPRefType.ACT: "activations (forward and recompute)",
    _FSDPRefType.TEMP: "backward temporaries",
    _FSDPRefType.BUFFER: "buffers (4-bit quant state, rotary tables)",
    _FSDPRefType.INP: "inputs",
}


class PhaseTracker(FSDPMemTracker):
    def __init__(self, model, optimizer, layer_classes: tuple, offload: bool, embed) -> None:
        super().__init__(model, optimizer)
        prefix = type(model).__name__
        named = list(model.named_modules())
        layers = [name for name, m in named if isinstance(m, layer_classes)]
        self.layer_index = {f"{prefix}.{name}": i for i, name in enumerate(layers)}
        self.n_layers = len(layers)
        self.embed_name = next((f"{prefix}.{name}" for name, m in named if m is embed), None)
        self.offload = offload
        self.step_phase = "forward"  # where the step is (step.train_step marks it): forward | clipping | optimizer
        self.layers_seen = {False: False, True: False}  # this micro-batch has reached a layer: forward, backward
        self.peaks: dict[str, tuple[int, dict[str, int]]] = {}

    def count(self, tensors, category=_FSDPRefType.BUFFER) -> None:
        """Count tensors the tracker cannot find by itself (made before it started, held by no module as a
        parameter or buffer): bitsandbytes' quant state, kept on the Linear4bit module."""
        for t in tensors:
            self._update_and_maybe_create_winfos(t, category)

    def _fsdp_state_pre_forward(self, fsdp_mod, orig):
        """The tracker's instrumentation, except for a no-grad forward within the same step (DPO's reference, KTO's
        KL and reference forwards): the tracker takes a second forward of the root for the next step and refuses
        it. There FSDP's own pre-forward runs and the unsharded parameters are counted, as the tracker does."""
        tracked = super()._fsdp_state_pre_forward(fsdp_mod, orig)

        @wraps(orig)
        def inner(*args, **kwargs):
            if self.step_phase != REFERENCE or fsdp_mod not in self.memory_tracking:
                return tracked(*args, **kwargs)
            self._fsdp_state = _FSDPState.PRE_FW
            args, kwargs = orig(*args, **kwargs)
            group = fsdp_mod._get_fsdp_state()._fsdp_param_group
            for fsdp_param in group.fsdp_params if group else ():
                self._update_and_maybe_create_winfos(fsdp_param.unsharded_param, _FSDPRefType.UNSHARDED_PARAM)
            self._fsdp_state = _FSDPState.FW
            return args, kwargs

        return inner

    def _fsdp_param_group_pre_backward(self, fsdp_mod, orig):
        return self._if_forward_ran(fsdp_mod, orig, super()._fsdp_param_group_pre_backward(fsdp_mod, orig))

    def _fsdp_param_group_post_backward(self, fsdp_mod, orig):
        return self._if_forward_ran(fsdp_mod, orig, super()._fsdp_param_group_post_backward(fsdp_mod, orig))

    def _if_forward_ran(self, fsdp_mod, orig, wrapped):
        """The tracker's instrumentation for a module whose forward it saw; FSDP's own hook for one whose forward
        never ran (lm_head under TRL's fused head: its own unit, or a member of the tied [norm, embedding, head]
        group whose hooks the tracker installs once per member)."""

        def inner(*args, **kwargs):
            return (wrapped if fsdp_mod in self.memory_tracking else orig)(*args, **kwargs)

        return inner

    def mark(self, step_phase: str, new_micro_batch: bool = True) -> None:
        self.step_phase = step_phase
        if step_phase == "forward" and new_micro_batch:  # the tracker refuses a second forward with old stats
            self.layers_seen = {False: False, True: False}
            self.reset_mod_stats()

    def phase(self) -> str:
        if self.step_phase != "forward":
            return self.step_phase
        bw = self._mod_tracker.is_bw
        stage = "backward" if bw else "forward"
        parents = self._mod_tracker.parents
        active = [self.layer_index[name] for name in parents if name in self.layer_index]
        if active:  # two while backward passes from one layer to the next: the one it has reached (see above)
            i = min(active) if bw else max(active)
            self.layers_seen[bw] = True
            where = "first" if i == 0 else "last" if i == self.n_layers - 1 else "middle"
            return f"{stage}: {where} layer"
        if self.embed_name in parents:
            return f"{stage}: input embedding"
        if bw:
            return "backward: after the layers" if self.layers_seen[bw] else "backward: loss and head"
        return "forward: norm, head and loss" if self.layers_seen[bw] else "forward: before the layers"

    def device_bytes(self, snap: dict) -> int:
        if not self.offload:
            return snap[TOTAL]
        return snap[TOTAL] - sum(snap.get(k, 0) for k in HOST_WHEN_OFFLOADED)

    def _update_peak_stats(self, peak_state) -> None:
        super()._update_peak_stats(peak_state)
        key = None
        for snap in self._curr_mem_snap.values():
            total = self.device_bytes(snap)
            key = key or self.phase()
            if total > self.peaks.get(key, (-1,))[0]:
                self.peaks[key] = (total, {CATEGORY.get(k, str(k)): v for k, v in snap.items() if k != TOTAL})
