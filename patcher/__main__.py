from patcher.cli import main

raise SystemExit(main())
