from ampkit.cli import main

raise SystemExit(main())
