"""The engine's settings: one frozen object, read once at start-up and passed down.

Every setting comes from a ``WORKFLOW_ENGINE_*`` environment variable, and the command line may
override it. No other module reads the environment. A capability's own settings are a section:
a frozen dataclass field of `Settings` whose variables are ``WORKFLOW_ENGINE_<SECTION>_<FIELD>``
(`JobSettings` is ``settings.job``, from ``WORKFLOW_ENGINE_JOB_TIMEOUT_SECONDS``...); a new
capability adds its section to `_sections` and reads it in its factory entry.

Import from here: `_settings` (the `Settings` object), `_sections` (its sections) and `_env`
(reading them from the environment) are its own.
"""

from workflow_engine.config._env import env_names, settings_from_env
from workflow_engine.config._sections import (
    ENV_PREFIX,
    JOB_UID_BASE,
    JOB_UID_COUNT,
    MAX_RETENTION_DAYS,
    OUTPUT_MODES,
    JobLimits,
    JobSettings,
    LlmSettings,
    McpSettings,
    NodeSettings,
    NodesSettings,
    RetentionSettings,
    is_loopback,
)
from workflow_engine.config._settings import LISTEN_NONE, Settings

__all__ = [
    "ENV_PREFIX",
    "JOB_UID_BASE",
    "JOB_UID_COUNT",
    "LISTEN_NONE",
    "MAX_RETENTION_DAYS",
    "OUTPUT_MODES",
    "JobLimits",
    "JobSettings",
    "LlmSettings",
    "McpSettings",
    "NodeSettings",
    "NodesSettings",
    "RetentionSettings",
    "Settings",
    "env_names",
    "is_loopback",
    "settings_from_env",
]
