from patcher.commands.entry import main

raise SystemExit(main())
