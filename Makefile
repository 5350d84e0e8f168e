.PHONY: all test race vet quickstart bench lint

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
