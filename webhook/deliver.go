package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/standmeet/events"
)

var (
	_ river.Worker[FanoutArgs]  = (*fanoutWorker)(nil)
	_ river.Worker[DeliverArgs] = (*deliverWorker)(nil)
	_ river.Worker[PruneArgs]   = (*pruneWorker)(nil)
)

// fanoutWorker turns one event into one delivery job per matching enabled
// endpoint, in one transaction.
type fanoutWorker struct {
	river.WorkerDefaults[FanoutArgs]
	w *Webhooks
}

func (f *fanoutWorker) Work(ctx context.Context, job *river.Job[FanoutArgs]) error {
	w, e := f.w, job.Args.Event
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		// Scopes filter in SQL; type globs in Go.
		rows, err := tx.Query(ctx, w.sql.MatchingEndpoints, e.Scope)
		if err != nil {
			return err
		}
		endpoints, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Endpoint, error) {
			var ep Endpoint
			return ep, row.Scan(&ep.ID, &ep.Types)
		})
		if err != nil {
			return err
		}
		var params []river.InsertManyParams
		for _, ep := range endpoints {
			if ep.matchesType(e.Type) {
				params = append(params, river.InsertManyParams{Args: deliverArgs(ep.ID, e, ""), InsertOpts: w.deliverOpts()})
			}
		}
		if len(params) == 0 {
			return nil
		}
		_, err = client.InsertManyTx(ctx, tx, params)
		return err
	})
}

// checkClient refuses a nil River client, and one of another schema than
// the Outbox's: its jobs would land where no worker of this outbox looks.
func (w *Webhooks) checkClient(client *river.Client[pgx.Tx]) error {
	if client == nil {
		return invalidConfig("client", "is nil")
	}
	if schema := client.Schema(); schema != w.outbox.Schema {
		return invalidConfig("client", "the River client's schema is %q, the Outbox's %q; name the same schema in both", schema, w.outbox.Schema)
	}
	return nil
}

func deliverArgs(endpoint uuid.UUID, e events.Event, replay string) DeliverArgs {
	return DeliverArgs{EndpointID: endpoint, EventID: e.ID, Type: e.Type, Timestamp: e.CreatedAt, Data: e.Payload, Replay: replay}
}

// deliverOpts: unique per (event, endpoint, replay) in every state but
// cancelled and discarded, so a fanout job retried after a crash inserts
// nothing twice.
func (w *Webhooks) deliverOpts() *river.InsertOpts {
	return &river.InsertOpts{Queue: w.config.Queue, MaxAttempts: MaxAttempts, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// retrySchedule is the pause after each failed attempt, before ±20 % jitter.
var retrySchedule = []time.Duration{5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}

// retryDelay is the pause after failed attempt n (1-based), jittered.
func retryDelay(n int, jitter float64) time.Duration {
	d := retrySchedule[min(max(n, 1), len(retrySchedule))-1]
	return time.Duration(float64(d) * (1 + 0.4*(jitter-0.5)))
}

// deliverWorker sends one event to one endpoint.
type deliverWorker struct {
	river.WorkerDefaults[DeliverArgs]
	w *Webhooks
}

// NextRetry follows the schedule of 5 s, 5 min, 30 min, 2 h, 5 h, 10 h,
// 10 h, each ±20 %.
func (d *deliverWorker) NextRetry(job *river.Job[DeliverArgs]) time.Time {
	return time.Now().Add(retryDelay(job.Attempt, rand.Float64()))
}

// Timeout leaves the request's own timeout (at most 1 min) in charge.
func (d *deliverWorker) Timeout(*river.Job[DeliverArgs]) time.Duration { return 2 * time.Minute }

// outcome classifies an attempt for the attempt log.
type outcome struct {
	status     int
	errorClass string // "" on success; "status", "timeout", "forbidden_address", "network", "redirect"
	err        string
	dialedIP   string
	response   string
	duration   time.Duration
}

// sent reports whether the attempt made a request: failures before one (no
// secret, a bad payload) say nothing of the endpoint's health.
func (o outcome) sent() bool {
	return o.errorClass != "secret" && o.errorClass != "payload" && o.errorClass != "request"
}

// Snooze bounds for Retry-After.
const (
	minSnooze = time.Second
	maxSnooze = time.Hour
)

// metaTries is the job metadata key counting the requests a delivery made.
// River's attempt counts only the failures that returned an error: a
// snooze gives its attempt back, so a Retry-After answer would never count.
const metaTries = "webhook_tries"

// triesSoFar reads metaTries from a job's metadata.
func triesSoFar(metadata []byte) int {
	var m struct {
		Tries int `json:"webhook_tries"`
	}
	_ = json.Unmarshal(metadata, &m)
	return m.Tries
}

func (d *deliverWorker) Work(ctx context.Context, job *river.Job[DeliverArgs]) error {
	w, a := d.w, job.Args
	ep, err := w.getForDelivery(ctx, a.EndpointID)
	if err := w.deliverable(job, &ep, err); err != nil {
		return err
	}
	if !w.acquire(ep.ID, ep.MaxInFlight) {
		return river.JobSnooze(time.Second) // the endpoint's concurrency is used up in this process; not a try
	}
	defer w.release(ep.ID)
	adm, err := w.admit(ctx, &ep, job)
	if err != nil {
		return err
	}
	if adm.wait > 0 {
		return river.JobSnooze(adm.wait) // the breaker is open, or the rate limit's slot is later; not a try
	}

	tries := triesSoFar(job.Metadata) + 1
	if err := river.MetadataSet(ctx, metaTries, tries); err != nil {
		return err
	}
	out, retryAfter := w.send(ctx, &ep, a)
	// The error holds a receiver's bytes (its status line, a Location): it
	// goes to the attempt log and, through the error returned, to
	// river_job.errors (jsonb, which cannot hold NUL): escaped and capped.
	out.err = errorText(out.err)
	return w.settle(ctx, &ep, a, tries, out, retryAfter, adm.probe)
}

// deliverable returns nil if job may be tried now, else how it ends:
// cancelled when its endpoint was deleted or disabled, or when it has
// outlived GiveUpAfter. err is getForDelivery's.
func (w *Webhooks) deliverable(job *river.Job[DeliverArgs], ep *Endpoint, err error) error {
	a := job.Args
	switch {
	case errors.Is(err, ErrNotFound):
		return river.JobCancel(fmt.Errorf("webhook: endpoint %s was deleted", a.EndpointID))
	case err != nil:
		return err
	case !ep.Enabled:
		return river.JobCancel(fmt.Errorf("webhook: endpoint %s is disabled: %s", ep.ID, ep.DisabledReason))
	case job.CreatedAt.Before(ep.EnabledAt):
		// Pending when the endpoint was disabled (running then, so Disable
		// could not cancel it): it ends as cancelled, as Disable promises.
		return river.JobCancel(fmt.Errorf("webhook: endpoint %s was disabled after this delivery was made", ep.ID))
	}
	if age := time.Since(job.CreatedAt); age >= w.config.GiveUpAfter {
		return river.JobCancel(fmt.Errorf("webhook: gave up the delivery of %s to %s after %d tries in %v (GiveUpAfter)",
			a.EventID, ep.ID, triesSoFar(job.Metadata), age.Round(time.Second)))
	}
	return nil
}

// settle records the attempt and returns how the job goes on: done on
// success; cancelled on 410 Gone, when the endpoint is disabled for failing
// too long, or after MaxAttempts tries; snoozed for a Retry-After; otherwise
// an error, which River retries on the schedule.
func (w *Webhooks) settle(ctx context.Context, ep *Endpoint, a DeliverArgs, tries int, out outcome, retryAfter time.Duration, probe bool) error {
	success := out.errorClass == ""
	gone := out.status == http.StatusGone
	if err := w.record(ctx, ep, a, tries, out, success, gone, probe); err != nil {
		if success {
			// Sent and answered 2xx: returning the error would send it again.
			w.config.Logger.ErrorContext(ctx, "webhook: delivered, but its outcome could not be recorded",
				slog.String("endpoint_id", ep.ID.String()), slog.String("event_id", a.EventID.String()), slog.String("error", err.Error()))
			return nil
		}
		return err
	}
	switch {
	case success:
		return nil
	case gone:
		w.cancelPendingQuietly(ctx, ep.ID)
		return river.JobCancel(fmt.Errorf("webhook: endpoint %s answered 410 Gone: disabled", ep.ID))
	}
	// Every failure counts toward auto-disable, Retry-After answers too.
	if disabled, err := w.autoDisable(ctx, ep); err != nil || disabled {
		if err == nil {
			w.cancelPendingQuietly(ctx, ep.ID)
			err = river.JobCancel(fmt.Errorf("webhook: endpoint %s failed for %v: disabled", ep.ID, w.config.AutoDisableAfter))
		}
		return err
	}
	failure := fmt.Errorf("webhook: delivery of %s to %s: %s %s", a.EventID, ep.ID, out.errorClass, out.err)
	if tries >= MaxAttempts {
		return river.JobCancel(fmt.Errorf("webhook: gave up after %d tries: %w", tries, failure))
	}
	if retryAfter > 0 {
		return river.JobSnooze(retryAfter)
	}
	return failure
}

// body is the delivery's body: {"type", "timestamp", "data"}.
func body(a DeliverArgs) ([]byte, error) {
	data := a.Data
	if len(data) == 0 {
		data = json.RawMessage("{}")
	}
	return json.Marshal(struct {
		Type      string          `json:"type"`
		Timestamp time.Time       `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}{a.Type, a.Timestamp.UTC(), data})
}

// send makes one attempt. It returns what happened and, for a 429, 502,
// 503 or 504 with Retry-After, how long to snooze.
func (w *Webhooks) send(ctx context.Context, ep *Endpoint, a DeliverArgs) (outcome, time.Duration) {
	w.clientOnce.Do(func() { w.client = w.guard.newClient(w.lookup, nil) })
	var out outcome
	// The address the request went to, new connection or reused.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if host, _, err := net.SplitHostPort(info.Conn.RemoteAddr().String()); err == nil {
			out.dialedIP = host
		}
	}})
	ctx, cancel := context.WithTimeout(ctx, ep.Timeout)
	defer cancel()
	req, class, err := w.request(ctx, ep, a)
	if err != nil {
		out.errorClass, out.err = class, err.Error()
		return out, 0
	}
	start := time.Now()
	resp, err := w.client.Do(req)
	out.duration = time.Since(start)
	if err != nil {
		out.errorClass, out.err = unanswered(err, req.URL)
		return out, 0
	}
	// Closing without draining the rest: a huge answer is cut off, not read.
	defer func() { _ = resp.Body.Close() }()
	snooze := w.answered(resp, start, &out)
	return out, snooze
}

// request builds the signed POST of a to ep. When it cannot, it returns the
// attempt's error class: "payload", "secret" or "request".
func (w *Webhooks) request(ctx context.Context, ep *Endpoint, a DeliverArgs) (*http.Request, string, error) {
	b, err := body(a)
	if err != nil {
		return nil, "payload", err
	}
	now := time.Now()
	secrets, err := w.openSecrets(ep, now)
	var secretHeaders map[string]string
	if err == nil {
		secretHeaders, err = w.openHeaders(ep)
	}
	if err != nil {
		return nil, "secret", err
	}
	sig, err := Sign(secrets, a.EventID.String(), now, b)
	if err != nil {
		return nil, "secret", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(b))
	if err != nil {
		return nil, "request", err
	}
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	for k, v := range secretHeaders {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "standmeet-events-webhook/1")
	req.Header.Set(HeaderID, a.EventID.String())
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(HeaderSignature, sig)
	return req, "", nil
}

// unanswered classifies a request that got no answer and says why, naming
// the endpoint by scheme and host only: net/http names the whole URL, whose
// path and query may hold a token.
func unanswered(err error, u *url.URL) (class, msg string) {
	msg = err.Error()
	var uerr *url.Error
	if errors.As(err, &uerr) {
		msg = uerr.Op + " " + u.Scheme + "://" + u.Host + ": " + uerr.Err.Error()
	}
	var nerr net.Error
	switch {
	case errors.Is(err, ErrForbiddenAddress):
		return "forbidden_address", msg
	case errors.As(err, &nerr) && nerr.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return "timeout", msg
	}
	return "network", msg
}

// answered fills out from the receiver's answer to a request sent at start,
// and returns how long to snooze for a 429, 502, 503 or 504 with
// Retry-After.
func (w *Webhooks) answered(resp *http.Response, start time.Time, out *outcome) time.Duration {
	// At most MaxResponseBytes are read: a huge answer costs nothing more.
	kept, _ := io.ReadAll(io.LimitReader(resp.Body, int64(w.config.MaxResponseBytes)))
	out.duration = time.Since(start)
	if len(kept) == w.config.MaxResponseBytes {
		kept = cutRune(kept)
	}
	out.status, out.response = resp.StatusCode, cleanText(kept)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return 0
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		out.errorClass, out.err = "redirect", "redirects are not followed: "+resp.Header.Get("Location")
		return 0
	}
	out.errorClass, out.err = "status", resp.Status
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		if d := retryAfter(resp.Header.Get("Retry-After"), time.Now()); d > 0 {
			return min(max(d, minSnooze), maxSnooze)
		}
	}
	return 0
}

// maxErrorBytes caps the error text of an attempt, stored in the attempt
// log and in river_job.errors once per try.
const maxErrorBytes = 1 << 10

// errorText makes an attempt's error storable: NUL and invalid UTF-8
// escaped (cleanText), at most maxErrorBytes of the original kept.
func errorText(s string) string {
	if len(s) <= maxErrorBytes {
		return cleanText([]byte(s))
	}
	return cleanText(cutRune([]byte(s[:maxErrorBytes]))) + " …"
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Sub(now)
	}
	return 0
}

// record writes the endpoint's state and the attempt log in one
// transaction: success clears failing_since; a failure sets it if unset; 410
// Gone disables the endpoint and records the disabled event. The log entry
// is written under a savepoint: a log that refuses it (a constraint, a
// trigger) costs the entry, logged as a warning, never the state.
func (w *Webhooks) record(ctx context.Context, ep *Endpoint, a DeliverArgs, attempt int, out outcome, success, gone, probe bool) error {
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if out.sent() {
			if err := w.recordHealth(ctx, tx, ep, success, probe); err != nil {
				return err
			}
		}
		var err error
		switch {
		case success:
			_, err = tx.Exec(ctx, w.sql.EndpointSucceeded, ep.ID)
		case gone:
			err = w.disable(ctx, tx, ep, "the endpoint answered 410 Gone")
		default:
			_, err = tx.Exec(ctx, w.sql.EndpointFailed, ep.ID)
		}
		if err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			_, err := sp.Exec(ctx, w.sql.InsertAttempt, ep.ID, a.EventID, attempt, out.status, out.errorClass, out.err, out.duration.Milliseconds(),
				out.dialedIP, out.response)
			return err
		})
		if err != nil {
			w.config.Logger.WarnContext(ctx, "webhook: the attempt log refused an entry", slog.String("endpoint_id", ep.ID.String()),
				slog.String("event_id", a.EventID.String()), slog.Int("attempt", attempt), slog.String("error", err.Error()))
		}
		return nil
	})
}

// autoDisable disables an endpoint that has failed every attempt for
// AutoDisableAfter, and reports whether it did.
func (w *Webhooks) autoDisable(ctx context.Context, ep *Endpoint) (bool, error) {
	disabled := false
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var failing bool
		if err := tx.QueryRow(ctx, w.sql.FailingFor, ep.ID, w.config.AutoDisableAfter.Milliseconds()).Scan(&failing); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		}
		if !failing {
			return nil
		}
		disabled = true
		return w.disable(ctx, tx, ep, fmt.Sprintf("every attempt failed for %v", w.config.AutoDisableAfter))
	})
	return disabled, err
}

// disable disables ep in tx and records EventEndpointDisabled through the
// outbox, in the same transaction: the host alerts on it like on any event.
// The event is recorded once in each of the endpoint's scopes (once without
// a scope for an endpoint that takes them all), so that the tenant's own
// endpoints hear it; it names the endpoint by ID and host, never by URL,
// whose path or query may hold a token.
func (w *Webhooks) disable(ctx context.Context, tx pgx.Tx, ep *Endpoint, reason string) error {
	if _, err := tx.Exec(ctx, w.sql.DisableEndpoint, ep.ID, reason); err != nil {
		return err
	}
	host := ""
	if u, err := url.Parse(ep.URL); err == nil {
		host = u.Host
	}
	payload, err := json.Marshal(DisabledEvent{EndpointID: ep.ID, Host: host, Scopes: ep.Scopes, Reason: reason})
	if err != nil {
		return err
	}
	scopes := ep.Scopes
	if len(scopes) == 0 {
		scopes = []string{""}
	}
	for _, scope := range scopes {
		if _, err := w.outbox.Record(ctx, tx, events.Event{Type: EventEndpointDisabled, Subject: "webhook_endpoint:" + ep.ID.String(),
			Scope: scope, Payload: payload}); err != nil {
			return err
		}
	}
	return nil
}

// cancelPendingQuietly cancels an endpoint's pending deliveries after it was
// disabled automatically. A failure is only logged: each of them is
// cancelled anyway when it runs and finds the endpoint disabled.
func (w *Webhooks) cancelPendingQuietly(ctx context.Context, endpoint uuid.UUID) {
	if _, err := w.cancelPending(ctx, endpoint); err != nil {
		w.config.Logger.WarnContext(ctx, err.Error(), slog.String("endpoint_id", endpoint.String()))
	}
}

func (w *Webhooks) acquire(id uuid.UUID, limit int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inFlight[id] >= limit {
		return false
	}
	w.inFlight[id]++
	return true
}

func (w *Webhooks) release(id uuid.UUID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inFlight[id]--; w.inFlight[id] <= 0 {
		delete(w.inFlight, id)
	}
}

// Replay delivers one event to one endpoint again (a new job, whatever
// became of the first). The event is read from the outbox: a deleted one
// (retention) returns an error wrapping events.ErrNotFound. Like
// events.Relay.Start it refuses a nil client and one whose schema is not
// Config.Outbox.Schema, with an [*events.ValidationError] for "client".
func (w *Webhooks) Replay(ctx context.Context, client *river.Client[pgx.Tx], eventID, endpointID uuid.UUID) error {
	if err := w.checkClient(client); err != nil {
		return err
	}
	info, err := w.outbox.GetEvent(ctx, w.pool, eventID)
	if err != nil {
		return err
	}
	if _, err := w.Get(ctx, endpointID); err != nil {
		return err
	}
	_, err = client.Insert(ctx, deliverArgs(endpointID, info.Event, uuid.Must(uuid.NewV7()).String()), w.deliverOpts())
	return err
}

// Recover delivers again, to one endpoint, every event whose delivery to it
// failed in [from, to) and never succeeded afterwards: after the endpoint
// was fixed (and enabled). It returns how many it queued; events deleted by
// retention meanwhile are skipped.
func (w *Webhooks) Recover(ctx context.Context, client *river.Client[pgx.Tx], endpointID uuid.UUID, from, to time.Time) (int, error) {
	if err := w.checkClient(client); err != nil {
		return 0, err
	}
	rows, err := w.pool.Query(ctx, w.sql.FailedEvents, endpointID, from, to)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return 0, err
	}
	n := 0
	for _, id := range ids {
		err := w.Replay(ctx, client, id, endpointID)
		if errors.Is(err, events.ErrNotFound) {
			continue
		}
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
