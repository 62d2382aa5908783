// The CLI entry point is written in CofferCommand.swift.
