package webhook

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
)

// HandlerMaxBodyBytes is the largest body Handler reads; a larger one is
// answered 413.
const HandlerMaxBodyBytes = 1 << 20

type deliveryKey struct{}

// Delivery is what Handler tells the next handler about a verified
// delivery.
type Delivery struct {
	// ID is the webhook-id header: the event's ID, the same for every
	// attempt of a delivery. Use it to do the work once.
	ID string
	// Timestamp is the webhook-timestamp header, within VerifyTolerance
	// of the receiver's clock.
	Timestamp time.Time
}

// DeliveryFrom returns the verified delivery that Handler put in ctx.
func DeliveryFrom(ctx context.Context) (Delivery, bool) {
	d, ok := ctx.Value(deliveryKey{}).(Delivery)
	return d, ok
}

// Handler is a receiver's side of the deliveries: it verifies each request
// as Verify does, with any of secrets (several while a secret rotates),
// and passes it on to next only when a signature matches and the timestamp
// is within VerifyTolerance (an older request is a replay). next reads the
// verified body from r.Body as usual and the delivery's ID from
// DeliveryFrom(r.Context()), to process each delivery once however often
// it comes. Requests that fail get 401; bodies over HandlerMaxBodyBytes get
// 413.
func Handler(secrets []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, HandlerMaxBodyBytes+1))
		if err != nil {
			http.Error(w, "webhook: reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > HandlerMaxBodyBytes {
			http.Error(w, "webhook: body too large", http.StatusRequestEntityTooLarge)
			return
		}
		now := time.Now()
		err = ErrInvalidSignature
		for _, s := range secrets {
			e := verifyAt(s, r.Header, body, now)
			if e == nil {
				err = nil
				break
			}
			if errors.Is(e, ErrTimestamp) || !errors.Is(err, ErrTimestamp) {
				err = e
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		ts, _ := strconv.ParseInt(r.Header.Get(HeaderTimestamp), 10, 64) // verified
		ctx := context.WithValue(r.Context(), deliveryKey{}, Delivery{ID: r.Header.Get(HeaderID), Timestamp: time.Unix(ts, 0)})
		r = r.WithContext(ctx)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}
