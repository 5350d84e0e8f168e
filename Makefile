.PHONY: all test race vet quickstart bench bench-smoke soak

all: vet test

test:
	go test ./...

race:
	go test -race -timeout 30m ./...

vet:
	go vet ./...
	gofmt -l . | (! grep .)

quickstart:
	go run ./examples/quickstart

bench:
	go run ./cmd/eventsbench -json bench-results.json

bench-smoke:
	go run ./cmd/eventsbench -smoke

soak:
	EVENTS_SOAK=10m go test -run TestChaosSoak -timeout 30m .
