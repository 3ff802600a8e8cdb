from patcher.entry import main

raise SystemExit(main())
