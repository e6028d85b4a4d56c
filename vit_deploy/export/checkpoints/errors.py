"""CheckpointError and CheckpointWarning: what every reader of a checkpoint raises or warns."""

from __future__ import annotations

from vit_deploy.runtime.errors import BAD_INPUT, VitDeployError


class CheckpointError(VitDeployError, ValueError):
    """A checkpoint that cannot be loaded into the model: says which keys and why."""

    exit_code = BAD_INPUT


class CheckpointWarning(UserWarning):
    """Tensors in a checkpoint that the model does not use and that do not change its
    outputs (a Hugging Face pooler, a masked-image-modelling token); `tensors` names them."""

    def __init__(self, message: str, tensors: tuple[str, ...] = (), where: str = ""):
        super().__init__(message)
        self.tensors, self.where = tuple(tensors), where

    @classmethod
    def unused(cls, where: str, tensors: tuple[str, ...]) -> CheckpointWarning:
        """The warning naming the tensors of the checkpoint at `where` that were not used."""
        from vit_deploy.export.checkpoints.describe import _some

        return cls(f"{where}: not used, these tensors do not change the exported outputs: "
                   f"{_some(list(tensors))}", tensors, where)
