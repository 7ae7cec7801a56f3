"""What both Trainer callbacks need: the model the Trainer really calls, and a loader whose
batch fetches are timed without touching the Trainer's loop."""

from __future__ import annotations

import gc


def find_wrapper(module):
    """The DistributedDataParallel or FSDP1 wrapper around `module` (a Trainer hands callbacks
    the bare module; the wrapper exists only inside its training loop), else `module`. FSDP2's
    fully_shard changes the module in place: it is its own wrapper."""
    if module is None:
        return None
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.nn.parallel import DataParallel, DistributedDataParallel as DDP
    except Exception:
        return module
    kinds = (DDP, FSDP, DataParallel)
    if isinstance(module, kinds):
        return module
    for obj in gc.get_objects():
        if isinstance(obj, kinds) and (getattr(obj, "module", None) is module
                                       or getattr(obj, "_fsdp_wrapped_module", None) is module):
            return obj
    return module


class TimedLoader:
    """Times each batch a loader hands to a loop gpuscope does not drive: the loader object
    gets a subclass of its own class whose __iter__ times every next() (attributes, len() and
    isinstance checks unchanged); `restore()` gives it its class back."""

    def __init__(self, loader, recorder):
        self.loader = loader
        self._cls = type(loader)  # the real class (not what a __class__ property says)
        rec = recorder

        def __iter__(inner_self):
            return rec.time_fetches(self._cls.__iter__(inner_self))

        sub = type(self._cls.__name__, (self._cls,), {"__iter__": __iter__,
                                                      "__module__": self._cls.__module__})
        try:  # object's own __class__ setter: wrappers such as accelerate's DataLoaderShard
            _set_class(loader, sub)  # make __class__ a read-only property that tells a lie
            self.active = True
        except (TypeError, AttributeError):  # cannot be swapped: no data timing, training goes on
            self.active = False

    def restore(self) -> None:
        if self.active and type(self.loader).__mro__[1] is self._cls:
            _set_class(self.loader, self._cls)
        self.active = False


_set_class = object.__dict__["__class__"].__set__

