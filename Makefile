.PHONY: all test race vet lint quickstart bench bench-smoke soak

all: vet lint test

# Quick: -short skips the 40 s chaos soak (CI runs it).
test:
	go test -short ./...

race:
	go test -race -timeout 30m ./...

vet:
	go vet ./...
	gofmt -l . | (! grep .)

lint:
	golangci-lint run ./...

quickstart:
	go run ./examples/quickstart

bench:
	go run ./cmd/eventsbench -json bench-results.json

bench-smoke:
	go run ./cmd/eventsbench -smoke

soak:
	EVENTS_SOAK=10m go test -run TestChaosSoak -timeout 30m .
