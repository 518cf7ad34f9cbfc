"""Write the OpenAPI document, as the service serves it with default settings, to docs/guide/openapi.json.

.venv/bin/python -m scripts.openapi_json     (make docs and make docs-build run it; the file is not committed)
"""

from __future__ import annotations

import json

from api.openapi import build_document
from core.settings import PROJECT_ROOT, Settings

TARGET = PROJECT_ROOT / "docs" / "guide" / "openapi.json"


def main() -> None:
    """Write the document built from the settings' defaults (the environment is not read)."""
    TARGET.write_text(json.dumps(build_document(Settings.model_construct()), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {TARGET.relative_to(PROJECT_ROOT)}")


if __name__ == "__main__":
    main()
