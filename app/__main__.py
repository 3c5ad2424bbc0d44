from __future__ import annotations

from app.cli import main

raise SystemExit(main())
