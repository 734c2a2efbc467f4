"""Where each model's resources live: in the stack itself, or, for a large catalogue, in one
nested stack per model.

A CloudFormation stack holds at most 500 resources (CloudFormation quotas; CDK refuses to
synthesize more), and each model brings about 25 (three job queues and a DLQ with their
policies, alarms, a worker service or endpoint with its scaling, a log group, roles). Nested
stacks count as one resource each in their parent, so a 50-model catalogue deploys as a parent
of ~130 resources and 50 nested stacks of ~25. CDK passes the references between them as nested
stack parameters and outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import NestedStack
from constructs import Construct

#: Up to this many models, everything stays in one stack (and keeps its logical ids).
NEST_ABOVE_MODELS = 8


class ModelScopes:
    """Gives each component the scope to create one model's resources in.

    Args:
        stack: the parent stack.
        models: model ids.
        nested: one nested stack per model (default: when there are more than
            :data:`NEST_ABOVE_MODELS` models).
    """

    def __init__(
        self, stack: Construct, models: Sequence[str], *, nested: bool | None = None
    ) -> None:
        self.nested = len(models) > NEST_ABOVE_MODELS if nested is None else nested
        self.stacks: dict[str, NestedStack] = {}
        if self.nested:
            self.stacks = {
                m: NestedStack(stack, f"Model-{m}", description=f"asyncinfer model {m}")
                for m in models
            }
        self._scopes: dict[tuple[str, str], Construct] = {}

    def of(self, owner: Construct, model: str) -> Construct:
        """The scope of ``owner``'s resources for ``model``: ``owner`` itself, or a construct
        named like ``owner`` inside the model's nested stack."""
        if not self.nested:
            return owner
        key = (owner.node.path, model)
        if key not in self._scopes:
            self._scopes[key] = Construct(self.stacks[model], owner.node.id)
        return self._scopes[key]
