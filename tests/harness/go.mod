module cairn.dev/harness

go 1.22
