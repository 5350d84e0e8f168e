package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The Standard Webhooks specification's published test vector.
const (
	vectorSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTS     = 1614265330
	vectorBody   = `{"test": 2432232314}`
	vectorSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func TestSignReproducesTheSpecificationVector(t *testing.T) {
	got, err := Sign([]string{vectorSecret}, vectorID, time.Unix(vectorTS, 0), []byte(vectorBody))
	require.NoError(t, err)
	require.Equal(t, vectorSig, got)
}

// independentSign is the spec written out again, without the package's code.
func independentSign(secret, id string, ts int64, body string) string {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%d.%s", id, ts, body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func TestVerify(t *testing.T) {
	require.Equal(t, vectorSig, independentSign(vectorSecret, vectorID, vectorTS, vectorBody))
	h := http.Header{}
	h.Set(HeaderID, vectorID)
	h.Set(HeaderTimestamp, fmt.Sprint(vectorTS))
	h.Set(HeaderSignature, "v1,bm9wZQ== "+vectorSig) // any one of several may match
	at := time.Unix(vectorTS, 0)
	require.NoError(t, verifyAt(vectorSecret, h, []byte(vectorBody), at))
	require.NoError(t, verifyAt(vectorSecret, h, []byte(vectorBody), at.Add(4*time.Minute)))
	require.ErrorIs(t, verifyAt(vectorSecret, h, []byte(vectorBody), at.Add(6*time.Minute)), ErrTimestamp)
	require.ErrorIs(t, verifyAt(vectorSecret, h, []byte(vectorBody), at.Add(-6*time.Minute)), ErrTimestamp)
	require.ErrorIs(t, verifyAt(vectorSecret, h, []byte(`{"test": 1}`), at), ErrInvalidSignature)
	require.ErrorIs(t, verifyAt(NewSecret(), h, []byte(vectorBody), at), ErrInvalidSignature)
	h.Del(HeaderSignature)
	require.ErrorIs(t, verifyAt(vectorSecret, h, []byte(vectorBody), at), ErrInvalidSignature)

	// Two secrets during a rotation: either verifies.
	old, next := NewSecret(), NewSecret()
	sigs, err := Sign([]string{old, next}, "evt", at, []byte("{}"))
	require.NoError(t, err)
	h.Set(HeaderID, "evt")
	h.Set(HeaderSignature, sigs)
	require.NoError(t, verifyAt(old, h, []byte("{}"), at))
	require.NoError(t, verifyAt(next, h, []byte("{}"), at))
	require.Len(t, strings.Fields(sigs), 2)
}
