"""The base of every value passed between layers: an immutable pydantic model that rejects unknown fields."""

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
