from ampkit.cli import console_main

console_main()
