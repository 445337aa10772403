from ump.cli import main

raise SystemExit(main())
