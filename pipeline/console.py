"""The console rules of a curation run (Ray Data's progress and notices, our progress bars) live in
catalog/console.py, one owner for all rooms; the engine takes them from here."""
from catalog.console import (RAY_DATA_NOTICES, TOKEN_NOTICE, WORKER_WARNINGS, progress, quiet_ray,
                             token_auth_notice)

__all__ = ["RAY_DATA_NOTICES", "TOKEN_NOTICE", "WORKER_WARNINGS", "progress", "quiet_ray", "token_auth_notice"]
